"""An installed kit (not only this source tree) carries its templates and image files."""

import subprocess
import sys
import zipfile

from helpers import REPO


def test_wheel_ships_templates_image_assets_and_examples(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("kit_cluster-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("kit/app.py", "kit/templates/Dockerfile.j2", "kit/images/sshd_config",
                 "kit/images/entrypoint.sh", "kit/images/build_horovod.sh", "kit/images/allreduce_check.py",
                 "kit/images/tf_check.py", "kit/templates/Dockerfile.tf.j2", "kit/templates/macros.j2",
                 "kit/examples/tf_multiworker.py", "kit/templates/ssh_config.j2", "kit/examples/cifar10_cnn_horovod.py", "kit/ansible/prepare.yml",
                 "kit/ansible/roles/nfs_server/tasks/main.yml", "kit/cluster/steps/keys.py", "kit/runners/ssh.py", "kit/jobs/commands/docker.py"):
        assert name in names
    sources = {f"kit/{p.relative_to(REPO / 'cli' / 'kit').as_posix()}" for p in (REPO / "cli" / "kit").rglob("*.py")}
    assert sources - names == set(), "modules of cli/kit the wheel leaves out (a package missing in pyproject.toml?)"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "kit = kit.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
