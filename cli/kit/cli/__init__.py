"""kit's command line, a module a command group; kit.app puts them together."""
