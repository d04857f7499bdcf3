"""The ``hivemesh`` command line: ``main``, and one module per command that imports its work inside it."""
