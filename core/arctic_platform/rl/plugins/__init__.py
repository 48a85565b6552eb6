"""The plugin system: hook specs, typed spec objects, the manager and the registry."""

from arctic_platform.rl.plugins.hookspecs import (
    ENTRY_POINT_GROUP,
    PROJECT_NAME,
    ArcticRLHookSpecs,
    hookimpl,
    hookspec,
)
from arctic_platform.rl.plugins.manager import (
    ArcticRLPluginManager,
    PluginRecord,
    new_plugin_manager,
)
from arctic_platform.rl.plugins.registry import Registry, get_registry, set_registry
from arctic_platform.rl.plugins.specs import (
    ENGINE_ROLES,
    BackendSpec,
    CommandSpec,
    EngineSpec,
    LossSpec,
    TrackerSpec,
    TransportSpec,
    not_implemented_yet,
    resolve_factory,
)

__all__ = [
    "ENGINE_ROLES",
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "ArcticRLHookSpecs",
    "ArcticRLPluginManager",
    "BackendSpec",
    "CommandSpec",
    "EngineSpec",
    "LossSpec",
    "PluginRecord",
    "Registry",
    "TrackerSpec",
    "TransportSpec",
    "get_registry",
    "hookimpl",
    "hookspec",
    "new_plugin_manager",
    "not_implemented_yet",
    "resolve_factory",
    "set_registry",
]
