"""Running peers: the daemon, what it is assembled from, its config file, process launch, export."""
