"""pflower's benchmarks: scripts that run grids of Flower runs, one raw record per run, and the report built from them.

The package is in layers; a module imports only from the layers below it (``tests/project/test_layers.py``):

1. ``records``: the raw records: schema, paths, writing and loading, their digest, and the vocabulary the tables
   read them with (``ok``, ``select``, ``axis``, ``mean``, ...).  Imports nothing of the app.  ``method_code``: the
   app's files a method's results depend on (from the registry) and their digests, which a record keeps.
2. ``running``: runs grid cells through Flower (``Bench``, a private simulation SuperLink) and turns a run's
   results folder into a record (``record_from_run``), with the machine and the code it ran on; resumable grids.
   ``families``: the specification of the equal-tuning grids (families, rows, settings, seeds, the selection
   rule, the plan of runs), read by the script that runs them and by the report alike; ``attack_grid``: the same
   for the robustness grid (methods x attacks x shares of attackers x aggregation rules, the order of its runs).
3. ``reporting``: the sections of ``RESULTS.md``, its figures, and the generated parts of ``docs/``, from the
   records and the grids' specification only.  ``protocol``: the equal-tuning protocol run on an engine (timing runs,
   selection with its extensions, every row at its chosen setting), for ``grids`` and ``own_data`` alike; it renders
   nothing.
4. the scripts, each run from the repository's root as ``python -m benchmarks.<name>`` (``--help`` says what it
   runs): ``defaults``, ``grids``, ``privacy``, ``baselines``, ``fedc2i``, ``fedc2i_speed``, ``fedcac``,
   ``client2vec``, ``pfedlia``, ``pifl``, ``scale``, ``speed``, ``gaps``, ``robustness``, ``float_noise``;
   ``own_data`` (the equal-tuning protocol on a user's own data, with its own choosing page); ``reproduce`` (re-runs a
   record's run config on today's code), ``report`` (rebuilds RESULTS.md, its figures and the generated blocks of
   docs/; ``--check``) and ``mutation_audit`` (mutmut over the modules you name; docs/mutation/README.md).  A script
   imports the layers below, never another script.

``benchmarks/run_committed.sh "<script> <args>"`` runs scripts on a commit's code while the working tree changes.
"""
