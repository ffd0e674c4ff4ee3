"""mage-rl."""
