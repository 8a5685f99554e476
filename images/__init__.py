"""Files copied into kit images (shipped inside the kit package as kit.images)."""
