# hilconform: the two commands a fresh Debian 12 machine needs.
#   make certify   set up everything, then certify the default emulated host
#   make test      set up everything, then run the project's tests
# Set-up steps are separate targets too: setup (system packages), venv, image.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= emulated:a100
PYTEST_ARGS ?=

APT_PACKAGES := qemu-system-x86 qemu-utils debootstrap e2fsprogs cpio pciutils python3-venv
NEEDED_TOOLS := qemu-system-x86_64 qemu-nbd debootstrap mkfs.ext4 cpio

.PHONY: certify test setup venv image qemu-prefix unit lint bench clean-image

certify: setup venv image qemu-prefix
	@echo "hilconform: certifying $(HOST): every DISC/LIFE/HP/AER/RST clause (docs/spec.md)"
	$(PY) -m pytest suites -n 2 --host $(HOST) $(PYTEST_ARGS)

test: setup venv image qemu-prefix
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

setup:
	@missing=""; for t in $(NEEDED_TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "hilconform: installing system packages (missing:$$missing)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES); \
		else \
			echo "hilconform: missing:$$missing. Run as root: apt-get install $(APT_PACKAGES)"; exit 1; \
		fi; \
	fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

image:
	@if [ "$$(id -u)" != 0 ] && ! $(PYTHON) vm-images/build_guest.py --check; then \
		echo "hilconform: the guest image needs building as root: sudo make image"; exit 1; fi
	$(PYTHON) vm-images/build_guest.py

# QEMU >= 10.1 with the vfio-user client, for hosts whose accelerators are device models
# (docs/device-models.md): the system's if new enough, else trixie-backports (Debian 13) or a
# private prefix in vm-images/build/qemu-prefix (Debian 12; built once, ~30 s, stamped).
qemu-prefix:
	@if [ "$$(id -u)" != 0 ] && ! $(PYTHON) vm-images/build_qemu_prefix.py --check; then \
		echo "hilconform: the vfio-user QEMU needs setting up as root: sudo make qemu-prefix"; exit 1; fi
	$(PYTHON) vm-images/build_qemu_prefix.py

lint: venv
	$(VENV)/bin/ruff check .

bench: setup venv image
	$(PY) benchmarks/guest_boot.py

clean-image:
	rm -rf vm-images/build
