"""The lab: the tools that reproduce gssgd's studies, beside the library (not in its wheel).

- :mod:`gssgd_lab.cluster`: an emulated cluster on one machine, P workers in network
  namespaces on tbf-shaped links (needs root);
- :mod:`gssgd_lab.workers`: the supervisor that runs one process per rank there (or on
  loopback) and collects their results;
- ``gssgd bench comm`` (:mod:`gssgd_lab.comm_bench`): one aggregation step of every method;
- ``gssgd bench train`` (:mod:`gssgd_lab.train_bench`): every method trained on the same
  links;
- ``gssgd bench kernels`` (:mod:`gssgd_lab.kernel_bench`): the Triton kernels against the
  torch path; :mod:`gssgd_lab.compress_bench` and :mod:`gssgd_lab.compression_shares` time
  the compressors' parts for ``tools/gpu_check.sh``;
- the tables and figures they write (:mod:`gssgd_lab.formatting`, ``figures``, ``markdown``,
  ``comm_report``, ``train_report``, ``kernel_report``).

Its commands join ``gssgd bench`` through the ``gssgd.bench`` entry points of
``lab/pyproject.toml``. It imports gssgd's public names; gssgd never imports it.
"""
