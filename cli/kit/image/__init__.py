"""The training image: its settings' flavors, its recipe and wheels, the base it starts FROM, the build and its
check, and how it reaches hosts (relay) and other runtimes (export, venv, push)."""
