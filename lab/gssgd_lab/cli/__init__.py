"""The lab's ``gssgd bench`` subcommands (``comm``, ``train``, ``kernels``), each a module
with ``add_parser(sub)`` and ``run(args)``, registered as ``gssgd.bench`` entry points."""
