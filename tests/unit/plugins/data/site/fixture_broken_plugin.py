"""A plugin whose import fails: it must be recorded, never stop the others."""

import a_module_that_does_not_exist  # noqa: F401
