"""QoS between tenants: admission limits, the device scheduler and the gates that apply it."""
