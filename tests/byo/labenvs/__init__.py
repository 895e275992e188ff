"""Envs of a lab's own, importable as ``labenvs.<module>:<Name>`` (tests of env.id by
``module:Class``, of env.wrappers, of the pre-flight and of envs that fail while training)."""
