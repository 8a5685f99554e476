"""The training network: which of the networks between the hosts the ranks talk over, found by measurement.

Real GPU servers have a management network (what SSH and hosts.txt reach) and a fast fabric beside it, plus decoys
such as docker0. kit reads every host's interfaces and RDMA ports, checks from where the ranks run which candidate
subnets join which hosts, and trains over the fastest that joins them all.

links     a host's interfaces and RDMA ports: the sh that reads them, the pure parser (shipped)
choose    the candidates and the choice among them; pure (shipped)
survey    the survey's protocol: checks, bandwidth probe, decision, run where the ranks run (shipped)
shipped   links, choose and survey as one standard-library script, for the containers and a Slurm job's tasks
measure   kit's side: the survey on a cluster's containers, the record of the choice, what each launcher gets
rdma      what a container needs for RDMA, and NCCL_IB_HCA
"""
