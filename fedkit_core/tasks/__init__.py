"""Tasks: where a run's data comes from. See :mod:`fedkit_core.tasks.registry`."""

from fedkit_core.tasks.registry import all_tasks, get_task, register_task
from fedkit_core.tasks.spec import TaskSpec

__all__ = ["TaskSpec", "all_tasks", "get_task", "register_task"]
