"""Multi-machine deployment (deploy/README.md).  A package so that its scripts run as modules from the repository
root, with no edits of ``sys.path``: ``python -m deploy.local_cluster``, ``python -m deploy.export_partitions``,
``python -m deploy.make_proxy_conf``, ``python -m deploy.pflower_deploy.demo_page``.  Nothing here imports anything:
``python -m deploy.pflower_deploy.pipconf`` runs on a bare interpreter."""
