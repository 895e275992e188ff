"""The staleness controller: a scheduler plugin (``plugin.py``) holding each run's books
(``books.py``), which admit explorer work by the window law (``law.py``) and the replay-ratio
pacing, from the settings declared once in ``settings.py``."""
