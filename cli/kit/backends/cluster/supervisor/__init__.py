"""A job's supervisor, and the launch commands it starts: Python's standard library only.

kit sends this package's modules, as one script (shipped.source()), to the primary's container, where it runs
as the job's supervisor (`python -I -c SOURCE PLAN`), apart from kit's session: it starts the launcher (horovodrun, or a
script that starts torchrun or a TF worker on every host over the cluster SSH), keeps the job's record in its folder
(pid, output.log, started, ended, exit), watches the ranks' progress (the rank launcher's heartbeat, see
kit.jobs.commands.horovod) and, by the job's failure policy, starts it again on the hosts that still answer
(`kit run --restarts N --min-np M`) with KIT_RESTART=<n> in its environment. kit imports the same builders
(horovodrun, torchrun_argv, fanout_script, ...) for the first launch, so a restart is launched as the first.

Every process of a job carries KIT_JOB=<id>; the supervisor carries KIT_SUPERVISOR=<id> alone, so stopping
what is left of a job (reap_script) never stops the supervisor, which records the end.

launch      the launch commands and the shell scripts kit and the supervisor both build; the job's Plan
heartbeats  the ranks' heartbeats and stacks, and the hang watch
starter     kit's conversation that starts a job (`python -I -c SOURCE --start`)
supervise   the supervisor proper and its restart policy; the script's entry point
shipped     the script itself, made of the modules above (kit's side only: not shipped)
"""
