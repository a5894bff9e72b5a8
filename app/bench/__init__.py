"""The benches: figures for people to read, never asserted (``branchwise bench``).

* :mod:`app.bench.compare`: ``branchwise bench [--llama-server PATH]``: one table, each
  figure beside llama-server's in the same run with their ratio: restore, first-turn
  snapshot, prefill, plain and prompt-lookup decode.
* :mod:`app.bench.store`: ``branchwise bench --store``: cold prefill against a resume through the
  prefix store, restore throughput, snapshot cost, sharing between branches.
* :mod:`app.bench.llama_server`: ``bench --llama-server PATH``: llama.cpp's own slot save
  and restore of the same prompt, and its prefill and decode ``timings``.
* :mod:`app.bench.serve`: ``bench --serve``: TTFT for a resent history after a restart,
  ``branchwise serve`` against ``python -m llama_cpp.server``.
* :mod:`app.bench.cpu`: ``bench --cpu``: prefill speed with weight repacking on and off.
* :mod:`app.bench.threads`: ``bench --threads``: prefill and decode speed per thread count.
* :mod:`app.bench.imports`: ``python -m app.bench.imports``: time and peak memory of an import.
"""
