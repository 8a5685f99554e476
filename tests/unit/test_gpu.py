"""The gpu flavor's checks: what its image is built for, the NCCL path on GPUs when there are some, and a plain
"not verified" when there are none: never a silent pass."""

import pytest

from kit.cli.build import cuda_rows
from kit.errors import VerifyFailed
from kit.cluster.steps import check
from kit.image.verify import CudaFacts, GpuCheck, ImageReport, check_gpus, gpu_check_plan, parse_allreduce

# What two ranks of `allreduce_check.py --cuda` print on an H100 host (format of images/allreduce_check.py).
CUDA_RANKS = """\
kit-allreduce rank=0 size=2 sum=3 expected=3 ok host=gpu-1 device=cuda:0 gpu=NVIDIA_H100_80GB_HBM3 driver=580.65.06 \
cuda=13.0 nccl=2.30.7
kit-allreduce rank=1 size=2 sum=3 expected=3 ok host=gpu-2 device=cuda:0 gpu=NVIDIA_H100_80GB_HBM3 driver=580.65.06 \
cuda=13.0 nccl=2.30.7
"""
FACTS = CudaFacts("13.0", ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"), "2.30.7", True)


def report(gpu_check):
    return ImageReport("kit-horovod:gpu-0", "sha256:0", 1, {}, None, (), FACTS, gpu_check)


def test_without_a_gpu_the_nccl_path_is_said_to_be_not_verified():
    assert gpu_check_plan(0, nvidia_runtime=True) == "no GPU is visible on this machine (nvidia-smi lists none)"
    assert "nvidia runtime" in gpu_check_plan(2, nvidia_runtime=False)
    assert gpu_check_plan(2, nvidia_runtime=True) is None
    nothing = check_gpus(client=None, tag="kit-horovod:gpu-0", gpus=0, nvidia_runtime=False)  # never contacts Docker
    assert nothing == GpuCheck(False, "no GPU is visible on this machine (nvidia-smi lists none)")
    rows = dict(cuda_rows(report(nothing)))
    assert rows["GPU check"] == ("the NCCL path was not verified: no GPU is visible on this machine (nvidia-smi "
                                 "lists none); kit up checks it on the hosts' GPUs")
    assert rows["CUDA"] == "13.0 (torch's build), GPU architectures sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"


def test_with_gpus_the_check_allreduces_cuda_tensors_and_names_what_it_ran_on():
    class Box:
        def __init__(self):
            self.ran = []

        def exec_run(self, argv):
            self.ran.append(argv)
            return 0, CUDA_RANKS.encode()

        def remove(self, force):
            pass

    class Containers:
        def __init__(self):
            self.box, self.asked = Box(), {}

        def run(self, tag, argv, **kw):
            self.asked = kw
            return self.box

    class Client:
        containers = Containers()
    found = check_gpus(Client(), "kit-horovod:gpu-0", gpus=2, nvidia_runtime=True)
    assert found.verified and [a.fact("gpu") for a in found.horovod] == ["NVIDIA_H100_80GB_HBM3"] * 2
    ran = [argv[2:] for argv in Client.containers.box.ran]  # after `timeout N`
    assert ran == [["horovodrun", "-np", "2", "-H", "localhost:2", "python", "/opt/kit/allreduce_check.py", "--cuda"],
                   ["torchrun", "--standalone", "--nproc-per-node", "2", "/opt/kit/allreduce_check.py", "--ddp"]]
    assert Client.containers.asked["device_requests"][0].capabilities == [["gpu"]]
    row = dict(cuda_rows(report(found)))["GPU check"]
    assert row.startswith("2 GPUs (NVIDIA H100 80GB HBM3, driver 580.65.06, CUDA 13.0, NCCL 2.30.7): CUDA tensors "
                          "allreduced through NCCL")


WRONG_RANKS = CUDA_RANKS.replace("sum=3 expected=3 ok", "sum=1 expected=3 WRONG", 1)


def client_replying(reply):
    """A Docker client whose throwaway container answers each command (argv) with reply(argv)."""
    class Box:
        def exec_run(self, argv):
            return 0, reply(argv).encode()

        def remove(self, force):
            pass

    class Client:
        class containers:
            @staticmethod
            def run(tag, argv, **kw):
                return Box()
    return Client()


def test_a_gpu_rank_that_sums_wrong_fails_the_check():
    with pytest.raises(VerifyFailed, match="the 2-process allreduce is wrong"):
        check_gpus(client_replying(lambda argv: WRONG_RANKS), "kit-horovod:gpu-0", gpus=2, nvidia_runtime=True)


def test_what_the_image_is_built_for_is_checked_against_the_chosen_line():
    assert FACTS.problems("13.0") == []
    assert FACTS.problems("12.8") == ["its torch is built for CUDA 13.0, not 12.8"]
    assert CudaFacts("13.0", (), "2.30.7", False).problems("13.0") == [
        "its torch lists no GPU architecture", "its Horovod was built without NCCL"]


def test_the_hosts_report_their_gpus_driver_cuda_and_nccl():
    ranks = parse_allreduce(CUDA_RANKS)
    assert ranks[1].fact("host") == "gpu-2" and ranks[1].fact("nccl") == "2.30.7"
    assert check.cuda_summary(ranks, {"gpu-1": "10.0.0.1"}) == {
        "10.0.0.1": "1 GPU: NVIDIA H100 80GB HBM3 (driver 580.65.06, CUDA 13.0, NCCL 2.30.7): CUDA allreduce through "
                    "NCCL ✓",
        "gpu-2": "1 GPU: NVIDIA H100 80GB HBM3 (driver 580.65.06, CUDA 13.0, NCCL 2.30.7): CUDA allreduce through "
                 "NCCL ✓"}


def test_a_ddp_rank_that_sums_wrong_is_named_as_torch_distributeds():
    ddp_wrong = client_replying(lambda argv: WRONG_RANKS if "torchrun" in argv else CUDA_RANKS)
    with pytest.raises(VerifyFailed) as e:
        check_gpus(ddp_wrong, "kit-horovod:gpu-0", gpus=2, nvidia_runtime=True)
    assert "torch.distributed (nccl backend) cannot allreduce" in e.value.hint and "--ddp" in e.value.command
