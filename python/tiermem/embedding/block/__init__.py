"""Tables in files and the research around them (Bandana): layouts that put rows used
together in one block (:mod:`.layout`), the admission the miniature caches pick
(:mod:`.admission`), and query-structured traces (:mod:`.traces`)."""
