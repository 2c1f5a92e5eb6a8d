"""Scale-out on Ray Serve: each model a deployment of the serving core, the OIP ingress in front."""
