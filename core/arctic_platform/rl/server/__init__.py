"""The server side: ``RLServer`` (transport-free operations) and ``JobManager`` on Ray."""

from arctic_platform.rl.server.jobs import Job, JobManager, JobState
from arctic_platform.rl.server.rl_server import RLServer

__all__ = ["Job", "JobManager", "JobState", "RLServer"]
