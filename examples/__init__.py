"""Training scripts; they ship inside the kit package as kit.examples, for `kit demo`."""
