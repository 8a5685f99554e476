"""Files between this machine and a cluster's workspace: `kit cp`'s arguments, its copies, and the safe
unpacking of what a host sends back."""
