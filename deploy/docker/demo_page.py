#!/usr/bin/env python3
"""README.md's sample output of the compose demo, rendered from a real run and checked against one:
deploy/pflower_deploy/demo_page.py says how.

    deploy/docker/build_local_base.sh 2>&1 | tee /tmp/build.log
    PFLOWER_BASE=pflower-base:local deploy/docker/run_demo.sh 2>&1 | tee /tmp/demo.log
    deploy/docker/demo_page.py update /tmp/build.log /tmp/demo.log     # the record and the README's block
    deploy/docker/demo_page.py check [/tmp/build.log /tmp/demo.log]    # exit 1 when the page does not match
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pflower_deploy.demo_page import main

if __name__ == "__main__":
    sys.exit(main())
