"""Write side: the image-folder source, image checks, and one writer per format."""
