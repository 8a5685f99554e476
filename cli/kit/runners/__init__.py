"""How kit reaches a host. Steps say *what* to run; a runner says *how*.

Runner.run(command) -> Result. SshRunner is the only module that imports
fabric/paramiko; DryRunner wraps any runner, passes reads through and records
changes instead of making them (it is `--dry-run`).
"""

from kit.runners.base import SSHD_READY_S, DryRunner, Result, Runner, run_until_ok

__all__ = ["SSHD_READY_S", "DryRunner", "Result", "Runner", "run_until_ok"]
