"""The ``kvsched`` subcommands, one module per area; :mod:`kvsched.cli` assembles them."""
