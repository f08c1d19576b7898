"""Real-browser tests: Debian's Chromium driven by Playwright against pytest-django's
live server. Fixtures and the ``login`` helper are in conftest.py."""
