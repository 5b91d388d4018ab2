"""pflower's deployment helpers, one module per concern (used by ``python -m deploy.local_cluster`` and
``python -m deploy.make_proxy_conf``):

- ``processes``: child processes in their own process groups, stopped by id; waiting for an HTTPS /health;
- ``credentials``: the CA and server certificate, SuperNode keys, ``flwr`` connection files;
- ``netns``: network namespaces with a veth pair each (the data holders' and the operator's "machines");
- ``proxy``: the nginx configuration in front of the SuperLink (Fleet routes for data holders, Control
  routes for the operator) and running it;
- ``probes``: what a data holder can reach from its namespace (HTTP probes, run as a script there);
- ``cluster``: the whole deployment on one machine, its checks and its JSON report;
- ``pipconf``: this machine's pip configuration, carried into the compose demo's image builds;
- ``demo_page``: the compose demo's README sample output, rendered from a recorded run and checked against a run.
"""

from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1]
REPO = DEPLOY.parent
