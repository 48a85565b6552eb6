"""The tests' shared kit: start and reap servers (``servers``), clients with their own state
dir (``clients``), rollouts as training rows (``rollouts``), the session's live server
(``live``) and the secret scan (``leaks``). Importable as ``support`` from every test folder
(``tests/`` is on ``sys.path`` through ``tests/conftest.py``)."""
