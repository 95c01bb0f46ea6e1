"""Speed and accuracy harness: the megakernel against stock vLLM, side by side, in one run."""

# The two sides every harness compares, as additional_config for vLLM (the plugin's A/B switch).
SIDE_CONFIG = {"megakernel": {"megakernel": {"enabled": True}}, "stock": {"megakernel": {"enabled": False}}}
