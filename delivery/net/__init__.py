"""The vetted network floor: the URL policy (``urlsafety``), the IP-pinned transport
(``pinned``) and the size- and time-bounded fetch (``fetch``). It sits below execution and
delivery, which both use it, and imports nothing from either."""
