# Outside tools, included by the Makefile.
# The GitHub Copilot CLI for the SDK engine (copilot / openai providers), pinned, from npm into
# .tools/copilot. The SDK pins an unpublished CLI version; this one is measured to work.

SUDO ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)
COPILOT_VERSION := 1.0.102
COPILOT_DIR := .tools/copilot
COPILOT_ARCH := $(patsubst x86_64,x64,$(patsubst aarch64,arm64,$(shell uname -m)))
COPILOT_CLI := $(COPILOT_DIR)/node_modules/@github/copilot-linux-$(COPILOT_ARCH)/copilot

.PHONY: copilot-cli

# Skips when the pinned version is already there; installs Debian's npm first when missing.
copilot-cli:
	@if [ -x $(COPILOT_CLI) ] && $(COPILOT_CLI) --binary-version 2>/dev/null \
		| grep -qx "Copilot binary version: $(COPILOT_VERSION)"; then exit 0; fi; \
	command -v npm >/dev/null 2>&1 || { \
		$(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; } && \
	npm install --prefix $(COPILOT_DIR) --save-exact --no-audit --no-fund --loglevel=error \
		@github/copilot@$(COPILOT_VERSION) && \
	$(COPILOT_CLI) --binary-version | grep -qx "Copilot binary version: $(COPILOT_VERSION)" || { \
		echo "the Copilot CLI $(COPILOT_VERSION) is missing at $(COPILOT_CLI)" >&2; exit 1; }
