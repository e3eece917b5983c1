"""Accounts: users, scrypt passwords, hashed access tokens and devices, registration
(open, and shared-secret), and profiles. The lowest of the domain services."""
