"""The staleness controller: a scheduler plugin (``plugin.py``) holding each run's books
(``books.py``), one per learner group, each composed of its admission (``admission.py``: credits
granted by the window law, ``window_law.py``, and the replay-ratio pacing, ``pacing.py``), its
accounting (``accounting.py``) and what is read of them (``view.py``), from the settings declared
once in ``settings.py``."""
