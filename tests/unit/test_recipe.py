"""The rendered recipe: essentials of each flavor, and tags that follow the inputs."""

import re
import subprocess
from importlib.resources import files

from kit.config.settings import ConfigFile, build_config
from kit.image import wheels
from kit.image.recipe import make_recipe


def stages(dockerfile: str) -> dict[str, tuple[str, str]]:
    """Dockerfile -> {stage name: (FROM image, the stage's instructions)}."""
    out, name = {}, None
    for line in dockerfile.splitlines():
        if m := re.match(r"^FROM (\S+) AS (\S+)$", line):
            name = m[2]
            out[name] = (m[1], "")
        elif name and not line.startswith("#"):
            out[name] = (out[name][0], out[name][1] + line + "\n")
    return out


def chain(st: dict, name: str) -> list[str]:
    """The stage and the stages it is built FROM, down to an image."""
    names = [name]
    while st[names[-1]][0] in st:
        names.append(st[names[-1]][0])
    return names


def recipe(**flags):
    return make_recipe(build_config(ConfigFile(), flags))


def test_gpu_image_has_one_cuda_from_torchs_wheels_and_no_cuda_base():
    st = stages(recipe(flavor="gpu").dockerfile)
    assert chain(st, "final") == ["final", "base"] and st["base"][0] == "debian:trixie-slim"
    assert chain(st, "builder") == ["builder", "torch", "base"]  # the compile pieces join torch's own venv
    assert '"cuda-toolkit[nvcc,cccl]"' in st["builder"][1] and "HOROVOD_CUDA_HOME" not in st["builder"][1]
    assert "cmake" not in st["builder"][1].split("apt-get install")[1].split("&&")[0]  # CMake 4 from pip
    with_base = stages(recipe(flavor="gpu", builder_image="nvidia/cuda:13.0.0-devel-ubuntu24.04").dockerfile)
    assert with_base["builder"][0] == "nvidia/cuda:13.0.0-devel-ubuntu24.04"  # a registry's CUDA base, if wanted
    assert "HOROVOD_CUDA_HOME=/usr/local/cuda" in with_base["builder"][1]


def test_gpu_horovod_gets_nccl_gpu_operations_and_gloo():
    builder = stages(recipe(flavor="gpu").dockerfile)["builder"][1]
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_PYTORCH=1",
                    "HOROVOD_WITHOUT_MPI=1", "HOROVOD_NCCL_LINK=SHARED"):
        assert setting in builder
    assert "build_horovod.sh /opt/kit/wheelhouse/horovod/* /opt/kit/dist" in builder  # only the archive: .resolved is hidden
    assert '"torch==2.14.1"' in recipe(flavor="gpu").dockerfile
    assert "HOROVOD_BUILD_CUDA_CC_LIST" not in builder  # every architecture nvcc knows, for users
    assert "HOROVOD_BUILD_CUDA_CC_LIST=90,120" in stages(recipe(flavor="gpu", cuda_archs=(90, "sm_120")).dockerfile)["builder"][1]


def test_open_mpi_is_optional():
    st = stages(recipe(flavor="gpu", with_mpi=True).dockerfile)
    assert "HOROVOD_WITH_MPI=1" in st["builder"][1] and "libopenmpi-dev" in st["builder"][1]
    assert "openmpi-bin" in st["base"][1]


def test_cxx_standard_fix_is_applied_to_both_cmakelists():
    """C++17, or C++20 where torch's headers require it (the lab builds both: cpu torch 2.13, gpu torch 2.14)."""
    r = recipe(flavor="gpu")
    script = next(f.text for f in r.files if f.name == "kit/build_horovod.sh")
    assert 'cxx=17\nif grep -qs \'C++20 or later\' "$site/torch/include/ATen/ATen.h"; then\n    cxx=20' in script
    assert 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD $cxx)/' in script
    assert '"$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"' in script
    assert "COPY kit/build_horovod.sh" in stages(r.dockerfile)["builder"][1]


def test_horovodrun_keeps_host_key_checking_on():
    script = next(f.text for f in recipe().files if f.name == "kit/build_horovod.sh")
    assert "sed -i 's/StrictHostKeyChecking=no/StrictHostKeyChecking=yes/' \"$src/horovod/runner/util/remote.py\"" \
        in script
    assert "grep -rn 'StrictHostKeyChecking=no' \"$src/horovod\"" in script


def test_sshd_is_set_up_key_only_without_baked_host_keys():
    r = recipe(flavor="gpu")
    st = stages(r.dockerfile)
    assert "openssh-server" in st["base"][1] and "openssh-client" in st["base"][1]
    assert "rm -f /etc/ssh/ssh_host_*" in st["base"][1]
    assert "COPY kit/sshd_config /etc/ssh/sshd_config" in st["final"][1]
    assert 'CMD ["sshd"]' in st["final"][1]
    sshd = {line.split()[0]: line.split(None, 1)[1] for line in
            files("kit.images").joinpath("sshd_config").read_text().splitlines() if line and line[0] != "#"}
    assert sshd["PasswordAuthentication"] == "no"
    assert sshd["KbdInteractiveAuthentication"] == "no"
    assert sshd["PermitRootLogin"] == "prohibit-password"
    assert sshd["HostKey"].startswith("/etc/kit/ssh/")
    entrypoint = next(f.text for f in r.files if f.name == "kit/entrypoint.sh")
    assert 'sshd -D -e -p "${KIT_SSH_PORT:-12345}"' in entrypoint


def test_compilers_and_wheelhouse_stay_out_of_the_final_image():
    st = stages(recipe().dockerfile)
    final_chain = chain(st, "final")
    for name in final_chain:
        assert not re.search(r"\b(g\+\+|gcc|cmake|-dev)\b", st[name][1]), name
        assert "wheelhouse" not in st[name][1], name
    assert "g++" in st["builder"][1]
    assert "COPY wheelhouse/torch/ /opt/kit/wheelhouse/torch/" in st["torch"][1]
    assert "COPY wheelhouse/build/ /opt/kit/wheelhouse/build/" in st["builder"][1]
    assert "COPY --from=builder /opt/kit/dist/" in st["final"][1]
    assert "pip install --no-cache-dir --no-deps /opt/kit/dist/*.whl" in st["final"][1]


def test_single_stage_recipe_is_one_stage_of_the_same_steps():
    multi, single = recipe(flavor="gpu"), make_recipe(build_config(ConfigFile(), {"flavor": "gpu"}), single_stage=True)
    st = stages(single.dockerfile)
    assert list(st) == ["base"] and st["base"][0] == "debian:trixie-slim"
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in st["base"][1]
    assert single.tag != multi.tag and "-single-" in single.tag


def test_ca_bundle_and_indexes_are_trusted_before_anything_is_fetched(ca_bundle):
    r = recipe(ca_bundle=ca_bundle, pip_index_urls=("https://mirror.example/simple", "file:///wheels"))
    base = stages(r.dockerfile)["base"][1]
    assert base.index("kit-extra-ca.crt") < base.index("apt-get update")
    assert "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in base
    assert 'PIP_INDEX_URL=https://mirror.example/simple PIP_EXTRA_INDEX_URL="file:///wheels"' in base
    assert any(f.name == "kit/extra-ca.crt" and f.source == ca_bundle.resolve() for f in r.files)


def test_extra_packages_are_quoted_and_land_after_horovod():
    st = stages(recipe(pip_packages=("tqdm>=4",), apt_packages=("htop",)).dockerfile)
    assert "pip install --no-cache-dir --no-index --find-links /opt/kit/wheelhouse/user 'tqdm>=4'" in st["extras"][1]
    assert "htop" in st["final"][1]
    assert "tqdm" not in st["builder"][1]


def test_extras_are_the_final_images_top_layers_so_a_change_of_them_changes_only_those():
    """Torch's venv comes whole from its stage; kit's tools and the user's packages come after Horovod, as what they
    changed in the venv (and what they removed, removed), so the layers below stay the same when they change."""
    for flavor, below in (("cpu", "torch"), ("tf-cpu", "venv")):
        st = stages(recipe(flavor=flavor, pip_packages=("tqdm>=4",)).dockerfile)
        assert st["extras"][0] == below
        extras = st["extras"][1]
        assert extras.index("venv_delta.py snapshot") < extras.index("py-spy") < extras.index("tqdm")
        assert extras.index("tqdm") < extras.index("venv_delta.py delta")
        final = st["final"][1]
        assert f"COPY --from={below} /opt/venv /opt/venv" in final
        assert final.index(f"COPY --from={below}") < final.index("xargs -r -d '\\n' rm -rf -- < /opt/kit/venv-removed")
        assert final.index("rm -rf -- < /opt/kit/venv-removed") < final.index("COPY --from=extras /opt/kit/venv-delta/ "
                                                                              "/opt/venv/") < final.index("COPY kit/sshd")
        if flavor == "cpu":
            assert final.index("dist/*.whl") < final.index("COPY --from=extras")
        assert "tqdm" not in final and "venv_delta" not in final


def test_torch_stage_drops_torchs_cpp_test_programs_and_keeps_what_runs(tmp_path):
    """The rendered removal, run against a torch folder shaped like 2.13's CPU wheel (with the venv moved under
    tmp_path): the C++ tests go, torch_shm_manager (multiprocessing's sharing), protoc and the libraries stay."""
    torch_stage = stages(recipe(flavor="cpu").dockerfile)["torch"][1]
    removal = next(part for part in torch_stage.split("&&") if "/torch/test" in part).strip()
    torch = tmp_path / "opt/venv/lib/python3.11/site-packages/torch"
    for rel in ("test/atest", "test/Dict_test", "bin/FileStoreTest", "bin/TCPStoreTest", "bin/test_api",
                "bin/test_jit", "bin/torch_shm_manager", "bin/protoc", "lib/libtorch_cpu.so", "lib/libc10.so"):
        (torch / rel).parent.mkdir(parents=True, exist_ok=True)
        (torch / rel).write_bytes(b"x")
    subprocess.run(["sh", "-c", removal.replace("/opt/venv", str(tmp_path / "opt/venv"))], check=True)
    left = sorted(str(f.relative_to(torch)) for f in torch.rglob("*") if f.is_file())
    assert left == ["bin/protoc", "bin/torch_shm_manager", "lib/libc10.so", "lib/libtorch_cpu.so"]


def test_horovod_source_replaces_the_release():
    r = recipe(horovod_source="git+https://github.com/horovod/horovod@3a31d93")
    assert "Horovod from git+https://github.com/horovod/horovod@3a31d93 built into a wheel" in r.dockerfile
    assert wheels.groups(r.config)[2] == wheels.Group("horovod", ("git+https://github.com/horovod/horovod@3a31d93",),
                                                     no_deps=True, sdist=True)


def resolved(folder):
    """A wheelhouse as kit.image.wheels.resolve leaves it: the torch group's files."""
    return wheels.Wheelhouse(folder, {"torch": sorted(folder.iterdir())})


def test_same_inputs_give_the_same_tag(wheelhouse, ca_bundle):
    a = make_recipe(build_config(ConfigFile(), {}), wheelhouse=resolved(wheelhouse), ca_bundle=ca_bundle)
    b = make_recipe(build_config(ConfigFile(), {}), wheelhouse=resolved(wheelhouse), ca_bundle=ca_bundle)
    assert a.tag == b.tag and a.key == b.key
    assert re.fullmatch(r"kit-horovod:cpu-[0-9a-f]{12}", a.tag)


def test_any_changed_input_gives_a_new_tag(wheelhouse, ca_bundle):
    def tag(flags=None, **inputs):
        return make_recipe(build_config(ConfigFile(), flags or {}), wheelhouse=resolved(wheelhouse), **inputs).tag
    base = tag()
    assert tag({"pip_packages": ("six",)}) != base
    assert tag({"torch": "2.12.0"}) != base
    assert tag(ca_bundle=ca_bundle) != base
    assert tag(base="kit-base/debian:bookworm") != base
    assert recipe().tag != base  # no wheels
    (wheelhouse / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"another build")
    assert tag() != base  # same file name, other content


def test_the_key_follows_the_settings_not_what_was_resolved(wheelhouse, ca_bundle, tmp_path):
    """An image is found again by its settings alone (kit up, a second kit build): nothing is resolved for that."""
    config = build_config(ConfigFile(), {})
    key = make_recipe(config).key
    assert make_recipe(config, wheelhouse=resolved(wheelhouse), base="kit-base/debian:bookworm").key == key
    assert recipe(pip_packages=("six",)).key != key
    assert recipe(flavor="tf-cpu").key != key
    assert make_recipe(config, single_stage=True).key != key
    assert recipe(ca_bundle=ca_bundle).key != key
    with_house = recipe(wheelhouse=wheelhouse).key
    assert with_house != key
    (wheelhouse / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"a wheel more")  # the user's own wheelhouse grew
    assert recipe(wheelhouse=wheelhouse).key != with_house


def test_the_key_changes_with_what_kit_renders_and_never_holds_a_password(monkeypatch):
    config = build_config(ConfigFile(), {})
    key = make_recipe(config).key
    monkeypatch.setattr(wheels, "HOROVOD_RUNTIME", wheels.HOROVOD_RUNTIME + ("scipy",))  # a kit that installs more
    assert make_recipe(config).key != key
    monkeypatch.undo()
    a = recipe(pip_index_urls=("https://u:first@pypi.lab/simple",)).key
    assert recipe(pip_index_urls=("https://u:second@pypi.lab/simple",)).key == a  # the password is not in it


def test_a_direct_url_package_is_installed_by_name_from_the_wheelhouse():
    st = stages(recipe(pip_packages=("mypkg[extra] @ https://pkgs.lab/mypkg-1.0-py3-none-any.whl", "tqdm>=4")).dockerfile)
    assert "--find-links /opt/kit/wheelhouse/user 'mypkg[extra]' 'tqdm>=4'" in st["extras"][1]
    assert "https://pkgs.lab" not in st["extras"][1]


def test_context_is_written_as_hashed(tmp_path, wheelhouse):
    r = make_recipe(build_config(ConfigFile(), {}), wheelhouse=resolved(wheelhouse))
    out = tmp_path / "ctx"
    out.mkdir()
    r.write(out)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(f.name for f in r.files)
    assert "wheelhouse/torch/.resolved" in written
    assert (out / "kit/entrypoint.sh").stat().st_mode & 0o111


def test_symlinked_wheels_reach_the_context_as_files(tmp_path, wheelhouse):
    linked = tmp_path / "linked"
    linked.mkdir()
    for wheel in wheelhouse.iterdir():
        (linked / wheel.name).symlink_to(wheel)
    config = build_config(ConfigFile(), {})
    r = make_recipe(config, wheelhouse=resolved(linked))
    assert r.tag == make_recipe(config, wheelhouse=resolved(wheelhouse)).tag
    out = tmp_path / "ctx"
    out.mkdir()
    r.write(out)
    written = out / "wheelhouse" / "torch" / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert not written.is_symlink() and written.read_bytes() == b"wheel one"


def test_container_ssh_client_reads_the_cluster_config():
    r = recipe()
    assert "COPY kit/ssh_config /etc/ssh/ssh_config.d/kit.conf" in stages(r.dockerfile)["final"][1]
    assert next(f.text for f in r.files if f.name == "kit/ssh_config").strip().endswith("Include /etc/kit/ssh/config")


def test_tf_flavors_are_tensorflow_with_keras_2_and_no_torch_or_horovod():
    for flavor, package in (("tf-cpu", '"tensorflow-cpu==2.21.0"'), ("tf-gpu", '"tensorflow[and-cuda]==2.21.0"')):
        r = recipe(flavor=flavor)
        st = stages(r.dockerfile)
        assert list(st) == ["base", "venv", "extras", "final"] and chain(st, "final") == ["final", "base"]
        assert st["base"][0] == "debian:bookworm-slim"
        assert package in st["venv"][1] and '"tf-keras==2.21.*"' in st["venv"][1]
        assert "ENV TF_USE_LEGACY_KERAS=1" in st["final"][1]
        assert "COPY kit/entrypoint.sh kit/tf_check.py /opt/kit/" in st["final"][1]
        assert not re.search(r"torch|horovod", r.dockerfile, re.I), r.dockerfile
        assert {f.name for f in r.files} >= {"kit/tf_check.py", "kit/sshd_config", "kit/entrypoint.sh"}
        assert not any("horovod" in f.name for f in r.files)
        assert re.fullmatch(rf"kit-tensorflow:{flavor}-[0-9a-f]{{12}}", r.tag)
    # tf-keras pins TensorFlow by name; the CPU wheel is another name, so tf-keras comes without its dependencies.
    assert '--no-deps "tf-keras' in recipe(flavor="tf-cpu").dockerfile
    assert "--no-deps" not in recipe(flavor="tf-gpu").dockerfile


def test_tf_and_horovod_images_share_their_base_stage(ca_bundle):
    """Same instructions, so Docker builds the base once and a host that has one image loads less of the other."""
    for gpu in (False, True):
        horovod = stages(recipe(flavor="cpu", ca_bundle=ca_bundle).dockerfile)["base"]
        tf = stages(recipe(flavor="tf-gpu" if gpu else "tf-cpu", ca_bundle=ca_bundle).dockerfile)["base"]
        assert tf == horovod


def test_tf_user_packages_land_in_the_extras_stage():
    st = stages(recipe(flavor="tf-cpu", pip_packages=("tqdm>=4",), apt_packages=("htop",)).dockerfile)
    assert "pip install --no-cache-dir --no-index --find-links /opt/kit/wheelhouse/user 'tqdm>=4'" in st["extras"][1]
    assert "tqdm" not in st["venv"][1] and "htop" in st["final"][1]


def test_single_stage_is_refused_for_the_tf_flavors():
    import pytest

    from kit.errors import BadInput
    with pytest.raises(BadInput, match="compiles nothing"):
        make_recipe(build_config(ConfigFile(), {"flavor": "tf-cpu"}), single_stage=True)
