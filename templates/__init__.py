"""Jinja2 templates kit renders (shipped inside the kit package as kit.templates)."""
