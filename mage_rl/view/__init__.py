"""``mage view``: a local web page of training runs and evaluations (:mod:`.build`)."""
