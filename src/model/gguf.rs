//! GGUF import (to be built).
