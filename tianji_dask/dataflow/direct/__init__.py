"""Large chunks straight from an explorer task to the learner's process: the wire format
(``wire.py``), the learner's sink (``sink.py``) and the explorer's sender (``send.py``)."""
