"""Model control: loads with overrides, repository polling, the config view."""
