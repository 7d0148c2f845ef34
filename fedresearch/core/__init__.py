"""The ground floor: settings, shared models and identifiers that every other floor may use."""
