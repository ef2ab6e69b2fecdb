"""White-box tests of private modules live here, and only here.

Every test outside ``tests/internal/`` imports public names only (the front doors listed
in docs/architecture.md, "Public names"); ``tests/test_public_names.py`` enforces it.
A test that needs a private name (a crash hook, the decision core, an adapter's
internals) belongs in this folder: ``unit/`` (the core and the adapters, in memory),
``property/`` (generated histories against the runtime) and ``contract/`` (one suite
run against both event stores and both command buses), and the other folders mirror
those of ``tests/`` for the real-server tests that need private names.
"""
