"""Ansible playbooks for host preparation; they ship inside the kit package as kit.ansible (`kit prepare`)."""
