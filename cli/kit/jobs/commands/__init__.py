"""Pure builders of the command lines kit runs on hosts."""
