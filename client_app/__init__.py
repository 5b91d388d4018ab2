"""The ClientApp (``client_app.app``) and the client side of every method.

:data:`IMPORT_STARTED` is when this package began to import (unix seconds).  Flower loads the ClientApp as
``client_app.app:app``, and importing that module imports this package first, so in a ClientApp's process it is the
moment the app module's imports begin: the ``timing`` record's ``app-import`` (client_app/app.py,
strategies/message_timing.py).  Nothing here may import anything slow: what it imports is not counted.
"""

import time

IMPORT_STARTED = time.time()
