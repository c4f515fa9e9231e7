"""The frozen task: the block (`model`), its fp64 oracle (`oracle`), input families (`inputs`)."""
