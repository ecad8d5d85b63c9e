# What the loop Makefiles share (included by scripts/rl.mk and scripts/multiturn.mk): strict bash
# recipes, the repository root, and the rlcr binary they run.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.SUFFIXES:
MAKEFLAGS += --no-builtin-rules

ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/..)
CARGO ?= cargo
# Optimisation level of rlcr's own code in the binary the loop runs (dependencies are always built
# at 3). 0 is what `cargo test` builds, so nothing is recompiled. 1 costs about 2 more minutes of
# compiling (2 cores) and makes the model's decode kernel about 10x faster: SmolLM2 needs it (8
# answers x 64 tokens: 25 CPU-s at 1, more than 270 at 0); the tiny model's loop is dominated by
# update/sft, which run in burn (already optimised). The two builds are cached side by side.
RLCR_OPT ?= 0
# The rlcr command. By default rlcr is built (cargo build, or nothing when it is up to date) the
# first time a recipe needs it, and every stage then runs the binary itself: one `cargo run` per
# stage cost 0.55 s of cargo's own checks, about 80 s of the main job's 143 stage runs. Set
# RLCR=/path/to/rlcr to use another build.
build_rlcr = $(or $(shell $(CARGO) build --config 'profile.dev.package.rlcr.opt-level=$(RLCR_OPT)' \
  --manifest-path $(ROOT)/Cargo.toml --bin rlcr --message-format=json-render-diagnostics \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1),$(error $(notdir $(firstword $(MAKEFILE_LIST))): building rlcr failed \
  (cargo's messages are above)))
ifeq ($(origin RLCR),undefined)
RLCR = $(eval RLCR := $$(build_rlcr))$(RLCR)
endif
PYTHON ?= python3
RUNS ?= runs
SEED ?= 0
DEVICE ?= cpu
