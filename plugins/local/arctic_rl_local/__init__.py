"""The ``local`` backend: starts (or attaches to) an Arctic RL server and Ray on this node."""
