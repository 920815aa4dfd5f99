@echo off
rem Double-click to install Halaman for this user (no administrator rights needed).
rem It adds Halaman to the Start menu; the first start sets up PyTorch and the default model.
powershell -NoProfile -ExecutionPolicy Bypass -File "%~dp0install.ps1" %*
