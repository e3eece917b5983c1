"""End-to-end encryption support: the server stores and relays keys; it never decrypts."""
