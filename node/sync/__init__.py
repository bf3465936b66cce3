"""Replicas coming to agree: join, state serving and download, repair and fork choice, drain (see `node`)."""
