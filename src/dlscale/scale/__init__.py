"""Scale-out on Ray: replicas of the whole server placed by Ray Serve, HAProxy in front."""
