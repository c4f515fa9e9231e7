"""The frozen task: the block (`model`), its fp64 oracle (`oracle`) and input families (`inputs`)."""
