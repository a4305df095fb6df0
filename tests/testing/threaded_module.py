"""A module that starts a thread when imported (for the launcher's tests)."""

import threading
import time

STARTED = threading.Thread(target=time.sleep, args=(3600,), name="started-on-import",
                           daemon=True)
STARTED.start()
