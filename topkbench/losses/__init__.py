"""Loss families and the method registry."""
